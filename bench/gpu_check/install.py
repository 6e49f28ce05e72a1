"""`python -m bench.gpu_check.install WHEELS SITE`: installs every wheel in WHEELS into SITE with
pip, offline (`--no-index --no-deps`: the GPU machine reaches no package registry; the folder
holds each package the image lacks, at one version, fetched beforehand by gpu/fetch-wheels.sh).
Prints what it installed; exits non-zero when the folder holds no wheel or pip fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    wheels, site = Path(argv[0]), Path(argv[1])
    found = sorted(wheels.glob("*.whl"))
    if not found:
        print(f"no wheels in {wheels}", file=sys.stderr)
        return 1
    size = sum(w.stat().st_size for w in found)
    print(f"installing {len(found)} wheels ({size / 2**20:.1f} MiB) into {site}", flush=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", str(site)]
    rc = subprocess.call(cmd + [str(w) for w in found])
    for wheel in found:
        print(wheel.name)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
