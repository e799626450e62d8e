"""A rank that logs events and text records from two threads until it is SIGKILLed.

It says what ``log()`` returned for on its standard output (:class:`Accepted` reads it), so a
test knows which records the write-ahead log must hold after the kill.
"""

from __future__ import annotations

TWO_THREADS = """
import sys, threading, time
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

bootstrap, prefix, spool, run_id, delivery_timeout_s = sys.argv[1:6]
settings = Settings(
    bootstrap=bootstrap, prefix=prefix,
    producer={"spool_dir": Path(spool), "delivery_timeout_s": float(delivery_timeout_s)},
)
logger = EventLogger(run_id, settings=settings)
print("producer", logger.producer_id, flush=True)
said = threading.Lock()

def events():
    for index in range(10**9):
        logger.log({"index": float(index)}, index, "rollout")
        with said:
            print("E", index, flush=True)
        time.sleep(0.002)

def records():
    for index in range(10**9):
        logger.log_record("INFO", 20, "trainer", f"record {index}", step=index)
        if index % 10 == 0:  # a record on every tenth line: the pipe keeps up
            with said:
                print("R", index, flush=True)

threading.Thread(target=events, daemon=True).start()
records()
"""


class Accepted:
    """What a two-threaded child said ``log()`` returned for: its producer id, the highest
    event index, the highest record index (a record on every tenth line)."""

    def __init__(self, lines: list[str]) -> None:
        self.producer_id = lines[0].split()[1]
        said = [line.split() for line in lines[1:]]
        self.events = max((int(n) for kind, n in said if kind == "E"), default=-1)
        self.records = max((int(n) for kind, n in said if kind == "R"), default=-1)
