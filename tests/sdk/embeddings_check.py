"""Embeddings through corral with the official OpenAI Python SDK; run by tests/it/sdk.rs.

Usage: python3 embeddings_check.py BASE_URL   (e.g. http://127.0.0.1:PORT/v1)

The SDK asks for base64 by default and decodes it to floats itself; a caller
that passes encoding_format="float" gets JSON numbers. Both callers of the same
inputs must share corral's entries and see the very same f32 values: the base64
caller each f32 exactly, the float caller its shortest decimal, as the provider
prints it (so the Python floats differ below f32 precision, as they do without
corral). Prints one JSON line of what was seen and exits non-zero if a check
failed.
"""

import json
import struct
import sys
import traceback

import openai

MODEL = "text-embedding-3-small"
FIRST = ["the sdk's first input", "the sdk's second input", "the sdk's third input"]
LATER = "embedded first as floats"


def as_f32(vector):
    """The f32 bit patterns a vector's floats name."""
    return list(struct.unpack(f"<{len(vector)}I", struct.pack(f"<{len(vector)}f", *vector)))


def main() -> int:
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test-sdk", max_retries=0, timeout=20)
    results = {"sdk_version": openai.__version__}
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    def create(inputs, **kwargs):
        raw = client.embeddings.with_raw_response.create(model=MODEL, input=inputs, **kwargs)
        response = raw.parse()
        vectors = [item.embedding for item in response.data]
        check([item.index for item in response.data] == list(range(len(inputs))), "indices")
        check(all(isinstance(v, float) for vector in vectors for v in vector), "not floats")
        return raw.headers.get("x-corral-items"), [as_f32(vector) for vector in vectors]

    try:
        # SDK default (base64 on the wire, decoded by the SDK), then float callers.
        results["default_items"], default = create(FIRST)
        results["float_items"], floats = create(FIRST, encoding_format="float")
        results["same_floats"] = default == floats
        check(results["same_floats"], "the base64 and float callers decoded different floats")
        # The other way round: floats first, then the default.
        results["later_float_items"], later_floats = create([LATER], encoding_format="float")
        results["later_default_items"], later_default = create([LATER])
        results["later_same_floats"] = later_floats == later_default
        check(results["later_same_floats"], "floats stored, base64 served: different floats")
        # A mixed batch: two cached inputs around a new one, in the caller's order.
        results["mixed_items"], mixed = create([FIRST[2], "a new input", FIRST[0]])
        results["mixed_in_order"] = mixed[0] == default[2] and mixed[2] == default[0]
        check(results["mixed_in_order"], "a mixed batch came back out of order")
        results["dimensions"] = len(default[0])
    except Exception as err:  # noqa: BLE001 - every failure is reported, not raised
        traceback.print_exc(file=sys.stderr)
        failures.append(f"{type(err).__name__}: {err}")

    results["failures"] = failures
    print(json.dumps(results))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
