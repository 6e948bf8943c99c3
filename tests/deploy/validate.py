"""Validates the deployment files offline and prints one JSON line.

    validate.py KUBERNETES_VERSION COMPOSE_FILE MANIFEST...

Kubernetes manifests: kubernetes-validate (strict: unknown fields are errors)
against the schemas it ships for KUBERNETES_VERSION. A resource whose schema is
not found is only a warning to that tool; here it is an error. The compose
file: the compose-spec JSON schema that check-jsonschema vendors, through its
CLI. Output: {"passed": ["kind/name", ...], "errors": ["...", ...]}.
"""

import json
import subprocess
import sys

import kubernetes_validate
import yaml


def main() -> None:
    version, compose, manifests = sys.argv[1], sys.argv[2], sys.argv[3:]
    passed, errors = [], []
    for path in manifests:
        with open(path, encoding="utf-8") as f:
            documents = [d for d in yaml.safe_load_all(f) if d]
        if not documents:
            errors.append(f"{path}: no resource")
        for resource in documents:
            name = f"{resource.get('kind', '?')}/{resource.get('metadata', {}).get('name', '?')}"
            try:
                kubernetes_validate.validate(resource, version, strict=True)
                passed.append(name)
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                errors.append(f"{path}: {name}: {where}: {e.message}")
            except Exception as e:  # schema not found, unsupported version, ...
                errors.append(f"{path}: {name}: {type(e).__name__}: {e}")
    check = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", compose],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        errors.append(f"{compose}: {check.stdout.strip()} {check.stderr.strip()}")
    print(json.dumps({"passed": passed, "errors": errors, "compose": check.stdout.strip()}))


if __name__ == "__main__":
    main()
