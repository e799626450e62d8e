"""Regenerate ``rlpulse/local/kafka/jars.txt`` from ``kafka/pom.xml`` with Maven.

Run after changing the pom (a new Kafka or log4j version)::

    python scripts/pin_jars.py

Maven resolves the pom's runtime dependencies in its repository layout into a temporary
directory; each jar's coordinates come from its path, and its size and SHA-256 are computed
here (old artifacts such as metrics-core 2.2.0 publish only SHA-1 and MD5). The first line
holds the pom's SHA-256: ``tests/unit/test_pinned_jars.py`` fails when the pom changed and the
pins did not. Needs ``mvn`` and a Java on PATH; nothing else in rlpulse does.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

KAFKA = Path(__file__).resolve().parent.parent / "rlpulse" / "local" / "kafka"


def pin_lines(pom: Path) -> list[str]:
    """The pins file's lines for ``pom``: its digest, then one line per runtime jar."""
    mvn = shutil.which("mvn")
    if mvn is None:
        sys.exit("mvn is not on PATH; regenerating the pins needs Maven (apt-get install maven)")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        command = [
            mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={out}", "-DincludeScope=runtime", "-Dmdep.useRepositoryLayout=true",
        ]  # fmt: skip
        subprocess.run(command, check=True)
        pins = []
        for jar in sorted(out.rglob("*.jar")):
            version_dir = jar.parent
            artifact = version_dir.parent.name
            group = ".".join(version_dir.parent.parent.relative_to(out).parts)
            if jar.name != f"{artifact}-{version_dir.name}.jar":
                sys.exit(f"{jar}: a classifier or an unexpected name; pin it by hand")
            data = jar.read_bytes()
            coordinates = f"{group}:{artifact}:{version_dir.name}"
            pins.append(f"{coordinates} {len(data)} {hashlib.sha256(data).hexdigest()}")
    header = [
        "# The jars `rlpulse broker up` runs Kafka from: group:artifact:version size sha256.",
        "# Made by scripts/pin_jars.py from pom.xml; do not edit by hand.",
        f"# pom.xml sha256 {hashlib.sha256(pom.read_bytes()).hexdigest()}",
    ]
    return header + sorted(pins)


def main() -> None:
    """Write the pins next to the pom (or print them with ``--print``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print instead of writing")
    arguments = parser.parse_args()
    text = "\n".join(pin_lines(KAFKA / "pom.xml")) + "\n"
    if arguments.print:
        sys.stdout.write(text)
    else:
        (KAFKA / "jars.txt").write_text(text)
        print(f"wrote {KAFKA / 'jars.txt'}: {text.count(chr(10)) - 3} jars")


if __name__ == "__main__":
    main()
