"""The .meta files of the Unity package (clients/unity).

A package installed from a git URL is read-only to Unity, so Unity cannot write the .meta files it
needs for each file and folder; without one an asset is ignored ("has no meta file, but it's in an
immutable folder"). They are kept in git. GUIDs are derived from the package name and the path, so
a file's GUID stays the same across runs and machines (Unity links assets by GUID).

    python tests/clients/unity/unity_meta.py           # write the missing .meta files
    python tests/clients/unity/unity_meta.py --check   # exit 1 if any is missing or stray
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "clients" / "unity"
PACKAGE_NAME = "com.xlm.sidecar"

_COMMON = "  externalObjects: {}\n  userData: \n  assetBundleName: \n  assetBundleVariant: \n"
_IMPORTERS = {
    ".cs": "MonoImporter:\n  externalObjects: {}\n  serializedVersion: 2\n  defaultReferences: []\n  executionOrder: 0\n"
           "  icon: {instanceID: 0}\n  userData: \n  assetBundleName: \n  assetBundleVariant: \n",
    ".asmdef": "AssemblyDefinitionImporter:\n" + _COMMON,
    ".md": "TextScriptImporter:\n" + _COMMON,
}


def guid_for(relative: str) -> str:
    return hashlib.md5(f"{PACKAGE_NAME}/{relative}".encode()).hexdigest()


def _ignored(path: Path) -> bool:
    """What Unity skips: names ending in ~ (Samples~), hidden names, and the .meta files themselves."""
    parts = path.relative_to(PACKAGE).parts
    return any(p.endswith("~") or p.startswith(".") for p in parts) or path.suffix == ".meta"


def assets() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if not _ignored(p))


def meta_text(path: Path) -> str:
    relative = path.relative_to(PACKAGE).as_posix()
    head = f"fileFormatVersion: 2\nguid: {guid_for(relative)}\n"
    if path.is_dir():
        return head + "folderAsset: yes\nDefaultImporter:\n" + _COMMON
    if path.name == "package.json":
        return head + "PackageManifestImporter:\n" + _COMMON
    return head + _IMPORTERS.get(path.suffix, "DefaultImporter:\n" + _COMMON)


def problems() -> list[str]:
    """Missing, stale or stray .meta files."""
    found = []
    for path in assets():
        meta = path.with_name(path.name + ".meta")
        if not meta.is_file():
            found.append(f"missing {meta.relative_to(PACKAGE)}")
        elif meta.read_text() != meta_text(path):
            found.append(f"stale {meta.relative_to(PACKAGE)}")
    for meta in PACKAGE.rglob("*.meta"):
        if not _ignored(meta.with_suffix("")) and not meta.with_suffix("").exists():
            found.append(f"stray {meta.relative_to(PACKAGE)}")
    return found


def write() -> None:
    for path in assets():
        path.with_name(path.name + ".meta").write_text(meta_text(path))


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        issues = problems()
        print("\n".join(issues) or "all .meta files present")
        sys.exit(1 if issues else 0)
    write()
