"""Check built octavo wheels without installing them (no torch needed).

    python tools/check_wheel.py DIST_DIR_OR_WHEEL...

For each ``octavo-*.whl``: the platform tag is a manylinux one (uploadable to PyPI), every
C++ kernel variant for the wheel's architecture is inside (setup.py builds them all; octavo
picks one at run time), and LICENSE, ``py.typed`` and the shipped model are packaged. Exits
1 naming what is missing. cibuildwheel runs it after auditwheel (pyproject.toml).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

VARIANTS = {
    "x86_64": ("avx512_bf16", "avx512", "avx2", "scalar"),
    "aarch64": ("neon", "scalar"),
}
REQUIRED_FILES = ("octavo/py.typed", "octavo/assets/default_model/model.safetensors")


def problems(wheel: Path) -> list[str]:
    """Everything wrong with one wheel ([] when it is fine)."""
    found: list[str] = []
    tag = wheel.name.removesuffix(".whl").split("-")[-1]
    arch = next((a for a in VARIANTS if tag.endswith(a)), None)
    if not re.match(r"^(manylinux_\d+_\d+|manylinux\d+)_", tag):
        found.append(f"platform tag {tag!r} is not a manylinux tag (run auditwheel repair)")
    names = set(zipfile.ZipFile(wheel).namelist())
    for variant in VARIANTS.get(arch or "", ("scalar",)):
        if not any(re.fullmatch(rf"octavo/_C_{variant}\.[^/]*\.so", n) for n in names):
            found.append(f"kernel variant octavo/_C_{variant}*.so is missing")
    for required in REQUIRED_FILES:
        if required not in names:
            found.append(f"{required} is missing")
    if not any(re.fullmatch(r"octavo-[^/]+\.dist-info/licenses/LICENSE", n) for n in names):
        found.append("the LICENSE file is missing from .dist-info/licenses")
    return found


def main(argv: list[str]) -> int:
    wheels = [w for a in argv for w in (sorted(Path(a).glob("octavo-*.whl")) if Path(a).is_dir() else [Path(a)])]
    if not wheels:
        print("check_wheel: no octavo-*.whl given", file=sys.stderr)
        return 1
    failed = 0
    for wheel in wheels:
        issues = problems(wheel)
        failed += bool(issues)
        print(f"{wheel.name}: " + ("ok" if not issues else "; ".join(issues)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
