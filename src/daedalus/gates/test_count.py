"""A gate command for `tests_passed`: run a test command, read its closing summary, print a measurement.

    python -m daedalus.gates.test_count -- python -m pytest tests/spec_decode -q

The sample is the number of passed tests in a run without failures or errors (any failure makes it 0);
the counts are evidence. A run whose output has no
summary line (the runner crashed, or collected nothing) is INVALID, never a FAIL.
"""

from __future__ import annotations

import re
import subprocess
import sys

from daedalus.schemas.gates import GateMeasurement

# pytest's closing line, e.g. "27 passed, 1 failed, 2 skipped in 3.1s" or "=== 27 passed in 1.2s ===".
SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped|xfailed|xpassed)\b")


def measure(output: str, returncode: int) -> GateMeasurement:
    counts: dict[str, int] = {}
    for line in output.splitlines()[::-1]:
        found = SUMMARY.findall(line)
        if found and (" in " in line or line.strip().startswith("=")):
            for number, word in found:
                counts[word.rstrip("s") if word == "errors" else word] = int(number)
            break
    if not counts:
        return GateMeasurement(
            samples=[0.0],
            unit="tests",
            method="test runner summary",
            invalid_reason=f"no test summary line in the output (exit {returncode}); did the runner crash?",
        )
    evidence = {word: str(number) for word, number in counts.items()}
    # A run with failures or errors passes no regression gate: "27 passed, 3 failed" counts as 0, not 27.
    broken = counts.get("failed", 0) + counts.get("error", 0)
    passed = 0 if broken else counts.get("passed", 0)
    return GateMeasurement(
        samples=[float(passed)], unit="tests", method="test runner summary", evidence=evidence
    )


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m daedalus.gates.test_count -- <test command>", file=sys.stderr)
        return 2
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
    print(measure(done.stdout + done.stderr, done.returncode).model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
