"""What the phased SDK check scripts (anthropic_check.py, responses_check.py) share: one phase
run with its checks collected, reported as one JSON line on stdout."""

import json
import sys
import traceback


async def run_phase(phase, results, body):
    """Runs `await body(check)`, where `check(ok, what)` records `what` as a failure unless `ok`;
    an exception is a failure too (its traceback goes to stderr). Prints `results` with the
    failures as one JSON line and returns the exit status: 1 if anything failed."""
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    try:
        await body(check)
    except Exception as err:  # noqa: BLE001 - every failure is reported, not raised
        traceback.print_exc(file=sys.stderr)
        failures.append(f"{phase}: {type(err).__name__}: {err}")
    results["failures"] = failures
    print(json.dumps(results))
    return 1 if failures else 0
