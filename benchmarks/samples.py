"""What rollout samples cost: the capture of a verl step, ``log_samples``, and how soon they show.

Three figures, each printed as JSON lines (``figures.printer``) with its target:

- ``log_samples``: the CPU time (``time.process_time``: the calling process, its threads
  included) of ``RunLink.log_samples`` with 1,024 samples of a hand-written loop (prompt,
  response, reward, group, data source, two scores, token ids), median of ``--rounds``
  calls after one warm-up. Target: at most 5 ms.
- ``verl_capture``: the capture of one verl v1 step of 16,384 samples (``--verl-samples``)
  from a real TransferQueue (``tq.init`` of verl's own config, on a local Ray cluster),
  in AgentLoopWorkerTQ's layout: what ``_compute_metrics`` already fetched is fetched first
  (verl's cost, not the capture's), then the capture runs
  (``verl_samples._v1_capture``: the fetch of the small fields, the columns, the statistics,
  the choice, the decoding of the chosen samples, the write-ahead log). Its CPU is counted
  in every process it runs in: this one and every Ray process (TransferQueue's controller
  and storage), read from ``/proc`` before and after. The tokenizer's ``decode`` calls are
  counted. Target: at most 50 ms, 16 decoded.
- ``latency``: a step of 16,384 samples logged by ``log_samples``, then timed until the run
  page's ``/api/step`` (``rlpulse ui``'s server, reading the live topics) holds all of them
  and until the archive (an archiver with ``archive.roll_s`` 2) does. Targets: 5 s and 10 s.

``RLPULSE_BOOTSTRAP`` names a broker; without it a local one is started (and stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from figures import printer

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.producers import EventLogger, RunLink
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ProducerSettings, Settings
from rlpulse.transport.topics import ensure_topics

emit = printer("samples")


def loop_samples(count: int, step: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` samples as a hand-written GRPO loop has them (groups of 16)."""
    rng = np.random.default_rng(seed + step)
    lengths = rng.integers(16, 512, count)
    rewards = rng.random(count)
    samples = []
    for index in range(count):
        ids = list(range(int(lengths[index])))
        samples.append(
            {
                "prompt": f"Question {index // 16}: what is {index} plus {step}?",
                "response": f"Let me think. {index} plus {step} is {index + step}. " * 4,
                "reward": float(rewards[index]),
                "group": f"q{index // 16}",
                "data_source": "gsm8k" if index % 3 else "math",
                "scores": {"accuracy": float(index % 2), "format": 1.0},
                "response_length": int(lengths[index]),
                "truncated": bool(lengths[index] >= 500),
                "response_ids": ids,
            }
        )
    return samples


def bench_log_samples(settings: Settings, rounds: int) -> None:
    # An EventLogger: a RunLink's rank 0 also holds a control client, whose librdkafka
    # threads spend CPU of their own whatever log_samples does.
    link = EventLogger(f"bench-samples-{uuid.uuid4().hex[:6]}", settings=settings)
    batches = [loop_samples(1024, step) for step in range(rounds + 1)]
    link.log_samples(batches[0], step=0)  # the first call makes the samples log
    spent = []
    for step in range(1, rounds + 1):
        before = time.process_time()
        link.log_samples(batches[step], step=step)
        spent.append((time.process_time() - before) * 1000)
    # The columnar door an integration uses: the same samples as columns already.
    from rlpulse.producers.caller.samples import columns_from_mappings

    built = [columns_from_mappings(batch) for batch in batches]
    columnar = []
    for step in range(1, rounds + 1):
        columns, texts, identity, _ = built[step]
        before = time.process_time()
        link.log_sample_columns(columns, identity, texts.__getitem__, rounds + step)
        columnar.append((time.process_time() - before) * 1000)
    link.close(60)
    emit(
        "log_sample_columns",
        samples=1024,
        rounds=rounds,
        cpu_ms_median=round(statistics.median(columnar), 3),
        cpu_ms_min=round(min(columnar), 3),
        cpu_ms_max=round(max(columnar), 3),
    )
    median = statistics.median(spent)
    emit(
        "log_samples",
        samples=1024,
        rounds=rounds,
        cpu_ms_median=round(median, 3),
        cpu_ms_min=round(min(spent), 3),
        cpu_ms_max=round(max(spent), 3),
        target_ms=5.0,
        met=median <= 5.0,
    )


def _ray_processes() -> list[psutil.Process]:
    """This process and the Ray actors (TransferQueue's controller and storage units).

    Ray's own daemons (GCS, raylet, dashboard) poll on their own schedule whatever the
    capture does, so they are left out.
    """
    found = [psutil.Process()]
    for process in psutil.process_iter(["cmdline"]):
        command = " ".join(process.info["cmdline"] or [])
        if process.pid != os.getpid() and command.startswith("ray::") and "IDLE" not in command:
            found.append(process)
    return found


def _cpu_s(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class CountingTokenizer:
    """A tokenizer's ``decode`` that counts its calls (the capture decodes only the chosen)."""

    def __init__(self) -> None:
        self.decoded = 0

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        self.decoded += 1
        return " ".join(f"t{int(token)}" for token in ids)


def bench_verl_capture(settings: Settings, count: int, response_tokens: int) -> None:
    import ray
    import torch
    import transfer_queue as tq
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from transfer_queue.metadata import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from rlpulse.producers.integrations import verl_samples

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
                f"data.max_response_length={response_tokens * 2}",
            ],
        )
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    tq.init(config.transfer_queue)
    try:
        rng = np.random.default_rng(0)
        lengths = rng.integers(response_tokens // 2, response_tokens * 3 // 2, count)
        keys, fields, tags = [], [], []
        for index in range(count):
            length = int(lengths[index])
            responses = torch.from_numpy(rng.integers(3, 50_000, length))
            score = torch.zeros(length)
            score[-1] = float(index % 5) / 4
            keys.append(f"uid{index // 16}_{index % 16}_0")
            fields.append(
                {
                    "prompts": torch.arange(64, dtype=torch.int64),
                    "responses": responses,
                    "response_mask": torch.ones(length, dtype=torch.int64),
                    "rm_scores": score,
                    "token_level_rewards": score,
                    "advantages": torch.full((length,), 0.1),
                    "returns": torch.full((length,), 0.1),
                    "num_turns": 2,
                    "uid": f"uid{index // 16}",
                    "data_source": "gsm8k",
                    "reward_model": {"ground_truth": "4"},
                    "extra_fields": {"reward_extra_info": {"acc": float(index % 2)}},
                }
            )
            tags.append({"prompt_len": 64, "response_len": length, "global_steps": 1})
        for start in range(0, count, 2048):
            tq.kv_batch_put(
                keys=keys[start : start + 2048],
                fields=list_of_dict_to_tensordict(fields[start : start + 2048]),
                tags=tags[start : start + 2048],
                partition_id="train",
            )
        del fields
        batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train")
        # What _compute_metrics fetches itself: verl's cost, before the capture's own.
        fetched = tq.kv_batch_get(
            keys=batch.keys,
            partition_id="train",
            select_fields=["prompts", "responses", "response_mask", "advantages", "rm_scores",
                           "num_turns"],
        )  # fmt: skip
        data = {
            name: fetched[name] for name in verl_samples._V1_FIELDS if name in set(fetched.keys())
        }
        tokenizer = CountingTokenizer()

        class Trainer:
            pass

        trainer = Trainer()
        # What the driver read from the dataloader (``_fetch_one_gen_batch``): each prompt's
        # uid, data source and ground truth; the capture notes them there (counted below).
        prompt_batch = list_of_dict_to_tensordict(
            [
                {"uid": f"uid{p}", "data_source": "gsm8k", "reward_model": {"ground_truth": "4"}}
                for p in range(count // 16)
            ]
        )
        trainer.config = OmegaConf.create(  # type: ignore[attr-defined]
            {"actor_rollout_ref": {"rollout": {"response_length": response_tokens * 2}}}
        )
        trainer.tokenizer = tokenizer  # type: ignore[attr-defined]
        processes = _ray_processes()
        # What TransferQueue charges for the one field the capture must fetch (the reward
        # extras: a dict a sample, serialised in its storage unit), on its own.
        fetches = []
        for _ in range(3):
            before = _cpu_s(processes)
            extras = tq.kv_batch_get(
                keys=keys, partition_id="train", select_fields=["extra_fields"]
            )
            verl_samples._values(extras["extra_fields"])
            fetches.append((_cpu_s(processes) - before) * 1000)
        emit(
            "verl_reward_extras_fetch",
            samples=count,
            cpu_ms=[round(value, 1) for value in fetches],
            cpu_ms_median=round(statistics.median(fetches), 1),
        )
        # The target's 16 texts (the quarters alone), then the defaults (+ 8 of one group).
        for label, group_texts in (("16 texts", 0), ("defaults", settings.samples.group_texts)):
            chosen = settings.updated({"samples.group_texts": group_texts})
            link = RunLink(f"bench-verl-{uuid.uuid4().hex[:6]}", settings=chosen)
            link.log({"warm": 1.0}, 0)
            spent, decoded = [], []
            for step in (1, 2, 3, 4, 5):
                tokenizer.decoded = 0
                before = _cpu_s(processes)
                verl_samples._note_prompts(trainer, prompt_batch)
                verl_samples._v1_capture(trainer, batch, data, link, step)
                spent.append((_cpu_s(processes) - before) * 1000)
                decoded.append(tokenizer.decoded // 2)  # a prompt and a response a sample
            link.close(120)
            median = statistics.median(spent)
            emit(
                "verl_capture",
                texts=label,
                samples=count,
                mean_response_tokens=int(lengths.mean()),
                processes=[" ".join(p.cmdline())[:40] for p in processes],
                cpu_ms=[round(value, 1) for value in spent],
                cpu_ms_median=round(median, 1),
                samples_decoded=decoded,
                target_ms=50.0,
                met=median <= 50.0,
            )
    finally:
        tq.close()
        ray.shutdown()


def bench_latency(settings: Settings, topics: Topics, work: Path, count: int) -> None:
    from rlpulse.ui.data import run_data
    from rlpulse.ui.server import UiServer

    root = work / "archive"
    archiver = ArchiverProcess(
        settings.bootstrap or "", topics.prefix, root, work / "archiver.log",
        {"archive.roll_s": 2, "archive.audit": "false"},
    ).start()  # fmt: skip
    page_settings = settings.updated(
        {"ui.lookback_s": 600.0, "ui.refresh_s": 1.0, "archive.root": str(root)}
    )
    data = run_data(page_settings, live=True)
    server = UiServer(data, "127.0.0.1", 0)
    server.start()
    try:
        time.sleep(3.0)  # the live tail and the archiver have joined their topics
        run_id = f"bench-latency-{uuid.uuid4().hex[:6]}"
        link = RunLink(run_id, settings=settings)
        link.log({"loss": 1.0}, 1)
        samples = loop_samples(count, 1)
        logged = time.monotonic()
        link.log_samples(samples, step=1)
        page_s = archive_s = None
        deadline = logged + 120
        while (page_s is None or archive_s is None) and time.monotonic() < deadline:
            now = time.monotonic()
            if page_s is None and _page_count(server.url, run_id) >= count:
                page_s = now - logged
            if archive_s is None and _archived(root, topics, run_id) >= count:
                archive_s = now - logged
            time.sleep(0.1)
        link.close(60)
        emit(
            "latency",
            samples=count,
            page_s=None if page_s is None else round(page_s, 2),
            archive_s=None if archive_s is None else round(archive_s, 2),
            roll_s=2,
            target_page_s=5.0,
            target_archive_s=10.0,
            met=page_s is not None and page_s <= 5 and archive_s is not None and archive_s <= 10,
        )
    finally:
        server.stop()
        data.close()
        archiver.stop()


def _page_count(url: str, run_id: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}api/step?id={run_id}&step=1", timeout=10) as answer:
            body = json.loads(answer.read())
    except OSError:
        return 0
    return sum(part["count"] for part in body.get("samples", []))


def _archived(root: Path, topics: Topics, run_id: str) -> int:
    if not root.exists():
        return 0
    try:
        _, rows = query_archive(
            str(root), topics, "SELECT count(*) FROM samples WHERE run_id = ?", [run_id]
        )
    except Exception:  # the first files may not be there yet
        return 0
    return int(rows[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--verl-samples", type=int, default=16_384)
    parser.add_argument("--response-tokens", type=int, default=512)
    parser.add_argument("--latency-samples", type=int, default=16_384)
    parser.add_argument("--skip", action="append", default=[], help="log_samples|verl|latency")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlpulse-bench-samples-") as temporary:
        work = Path(temporary)
        with bootstrap_or_local_broker(Settings(), work / "broker") as bootstrap:
            topics = Topics(f"bench-{uuid.uuid4().hex[:8]}")
            settings = Settings(
                bootstrap=bootstrap,
                prefix=topics.prefix,
                producer=ProducerSettings(spool_dir=work / "spool"),
            )
            ensure_topics(settings)
            if "log_samples" not in options.skip:
                bench_log_samples(settings, options.rounds)
            if "verl" not in options.skip:
                bench_verl_capture(settings, options.verl_samples, options.response_tokens)
            if "latency" not in options.skip:
                bench_latency(settings, topics, work, options.latency_samples)


if __name__ == "__main__":
    main()
