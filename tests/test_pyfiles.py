"""scripts/build_pyfiles.sh: the --py-files zip (tieredcore + spark_jobs) for Spark workers without the
package. Contents, reproducibility, the `make pyfiles` target, and that the zip alone (plus third-party
site-packages) imports the Spark jobs' modules."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "build_pyfiles.sh"
PACKAGES = ("tieredcore", "spark_jobs")


def build(out: Path) -> Path:
    r = subprocess.run([str(SCRIPT), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.is_file()
    return out


def source_files() -> set[str]:
    found = set()
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*"):
            rel = p.relative_to(ROOT)
            if p.is_file() and p.suffix in (".py", ".proto") and "__pycache__" not in rel.parts:
                found.add(rel.as_posix())
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("pyfiles") / "tiered-pyfiles.zip")


def test_contains_exactly_the_packages_python_and_proto_files(built):
    with zipfile.ZipFile(built) as zf:
        names = zf.namelist()
        files = {n for n in names if not n.endswith("/")}
        assert files == source_files()
        for key in (
            "tieredcore/__init__.py",
            "tieredcore/offload/offloader.py",  # a namespace package (no __init__.py)
            "tieredcore/formats/proto/DataFormats.proto",
            "tieredcore/formats/proto/MLDataFormats.proto",
            "tieredcore/formats/proto/DataFormats_pb2.py",
            "spark_jobs/__init__.py",
            "spark_jobs/_jobkit.py",
            "spark_jobs/offload_sweep.py",
            "spark_jobs/deletion_lag_cleanup.py",
            "spark_jobs/compact_segments.py",
        ):
            assert key in files
        assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]
        assert {n.split("/")[0] for n in names} == set(PACKAGES)
        # every directory has its own entry: zipimport needs one to find a namespace package
        dirs = {n for n in names if n.endswith("/")}
        for f in files:
            parts = f.split("/")[:-1]
            for i in range(len(parts)):
                assert "/".join(parts[: i + 1]) + "/" in dirs, f
        for n in files:
            assert zf.read(n) == (ROOT / n).read_bytes(), n
        assert zf.testzip() is None


def test_entries_sorted_with_fixed_timestamps_and_modes(built):
    with zipfile.ZipFile(built) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr >> 16 for i in infos if not i.is_dir()} == {0o100644}
    assert {i.compress_type for i in infos if not i.is_dir()} == {zipfile.ZIP_DEFLATED}


def test_two_builds_are_byte_identical(built, tmp_path):
    again = build(tmp_path / "elsewhere" / "again.zip")
    assert again.read_bytes() == built.read_bytes()
    assert not list(tmp_path.rglob("*.tmp"))  # written atomically, nothing left behind


def test_make_target_builds_the_same_zip(built, tmp_path):
    out = tmp_path / "from-make.zip"
    r = subprocess.run(["make", "-s", "pyfiles", f"PYFILES={out}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert out.read_bytes() == built.read_bytes()


def test_zip_alone_imports_the_jobs_modules(built, tmp_path):
    """Only the zip and the venv's third-party site-packages on sys.path: -S skips site (so the
    project's editable-install .pth is not read), -I ignores PYTHONPATH and the user site, and the
    working directory is an empty temporary directory."""
    site_packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    code = (
        "import sys\n"
        "zip_path, site_dirs = sys.argv[1], sys.argv[2:]\n"
        "sys.path[:] = [zip_path] + [p for p in sys.path if p and 'site-packages' not in p] + site_dirs\n"
        "import tieredcore.offload.offloader, spark_jobs.offload_sweep, spark_jobs.deletion_lag_cleanup\n"
        "import tieredcore.formats.proto.DataFormats_pb2, spark_jobs.compact_segments\n"
        "mods = [tieredcore.offload.offloader, spark_jobs.offload_sweep, spark_jobs.deletion_lag_cleanup,\n"
        "        tieredcore.formats.proto.DataFormats_pb2, spark_jobs.compact_segments]\n"
        "bad = [m.__file__ for m in mods if not m.__file__.startswith(zip_path + '/')]\n"
        "assert not bad, bad\n"
        "print('ok', mods[0].__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(built), *site_packages], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"ok {built}/tieredcore/offload/offloader.py")


def test_missing_package_fails_clearly(tmp_path):
    """The script refuses to build from a tree without the packages rather than writing an empty zip."""
    fake = tmp_path / "repo"
    (fake / "scripts").mkdir(parents=True)
    (fake / "scripts" / "build_pyfiles.sh").write_bytes(SCRIPT.read_bytes())
    (fake / "scripts" / "build_pyfiles.sh").chmod(0o755)
    (fake / "tieredcore").mkdir()
    (fake / "tieredcore" / "__init__.py").write_text("")
    r = subprocess.run([str(fake / "scripts" / "build_pyfiles.sh"), str(tmp_path / "out.zip")], cwd=tmp_path,
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "spark_jobs is missing" in r.stderr
    assert not (tmp_path / "out.zip").exists()
