"""Build the stand-in CANN libraries for the installed torch_npu.

`build()` compiles src/*.c with the system C compiler (C11, -Wall -Wextra
-Werror, against the wheel's ACL headers), generates stubs for every other
name torch_npu needs (generate.py), and links libascendcl.so plus the other
libraries torch_npu loads or dlopens (each a thin library that depends on
libascendcl.so, so a dlsym on any of them finds the whole runtime). The
result is cached in a directory keyed by the torch_npu version and a hash of
the sources; `environment()` gives the variables a torch_npu process needs.

    python tests/platforms/npu_standin/build.py [--python NPU_PYTHON] --print-env
"""
import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
CFLAGS = ["-std=c11", "-O1", "-g", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-pthread",
          "-D_GNU_SOURCE"]
GENERATED_CFLAGS = ["-Wno-deprecated-declarations"]
FLOAT_MATH = ["-lm"]

sys.path.insert(0, str(HERE))
import generate  # noqa: E402


def describe_torch_npu(python: str) -> dict:
    """Where the interpreter's torch_npu lives and its version (torch_npu is
    not imported: importing it needs the stand-ins)."""
    code = ("import importlib.metadata as m, json; d = m.distribution('torch_npu'); "
            "print(json.dumps({'dir': str(d.locate_file('torch_npu')), 'version': d.version}))")
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True,
                         env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")).stdout
    return json.loads(out)


def cache_root() -> Path:
    explicit = os.environ.get("NPU_STANDIN_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "npu_lifetime" / "npu_standin"


def source_hash(npu: dict) -> str:
    digest = hashlib.sha256()
    for path in sorted(SOURCES.glob("*")) + [HERE / "generate.py", HERE / "build.py"]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(json.dumps(npu, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) found: the stand-in CANN runtime is built at test time")
    return cc


def _compile(cc, source: Path, out: Path, flags, extra=()):
    subprocess.run([cc, *CFLAGS, *flags, *extra, f"-I{SOURCES}", "-c", str(source), "-o", str(out)], check=True)


def _defined_names(objects) -> set:
    out = subprocess.run(["nm", "--defined-only", "-g", *map(str, objects)], check=True, capture_output=True,
                         text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if len(line.split()) == 3}


def _link(cc, out: Path, inputs, *libraries):
    subprocess.run([cc, "-shared", "-pthread", "-o", str(out), *map(str, inputs), f"-L{out.parent}",
                    "-Wl,--no-as-needed", *libraries, "-Wl,-rpath,$ORIGIN", *FLOAT_MATH], check=True)


def _build_into(work: Path, npu: dict, python: str) -> dict:
    cc = compiler()
    npu_dir = Path(npu["dir"])
    flags = generate.include_flags(npu_dir) + [f"-I{work}"]
    generate.write_op_api_typedefs(work / "op_api_typedefs.h", npu_dir)
    objects = []
    for source in sorted(SOURCES.glob("*.c")):
        obj = work / (source.stem + ".o")
        _compile(cc, source, obj, flags)
        objects.append(obj)
    info = generate.scan(npu_dir, python)
    names = generate.stub_names(info, _defined_names(objects))
    headers = [Path(h) for h in info["headers"]]
    stubs = work / "generated_stubs.c"
    generate.write_stubs(stubs, names, generate.prototypes(npu_dir, headers), headers, npu_dir)
    _compile(cc, stubs, work / "generated_stubs.o", flags, GENERATED_CFLAGS)
    _link(cc, work / "libascendcl.so", objects + [work / "generated_stubs.o"])
    empty = work / "empty.c"
    empty.write_text("/* a stand-in library: its symbols come from libascendcl.so */\n"
                     "typedef int npu_standin_empty_translation_unit;\n")
    for lib in info["standin_libraries"]:
        if lib != "libascendcl":
            _link(cc, work / f"{lib}.so", [empty], "-lascendcl")
    for leftover in list(work.glob("*.o")) + [empty]:
        leftover.unlink()
    summary = {"torch_npu": npu, "libraries": info["standin_libraries"], "stubs": len(names),
               "needed_at_load": len(info["needed_at_load"]), "looked_up_by_name": len(info["looked_up_by_name"])}
    (work / "standin.json").write_text(json.dumps(summary, indent=1))
    return summary


def build(python: str = sys.executable, force: bool = False) -> Path:
    """The directory of stand-in libraries for PYTHON's torch_npu (built once)."""
    npu = describe_torch_npu(python)
    target = cache_root() / f"torch_npu-{npu['version']}-{source_hash(npu)}"
    if target.is_dir() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        _build_into(work, npu, python)
        if target.is_dir():
            shutil.rmtree(target)
        os.rename(work, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def environment(python: str = sys.executable, base=None) -> dict:
    """Variables a torch_npu process needs to run on the stand-ins."""
    libdir = build(python)
    base = os.environ if base is None else base
    path = [str(libdir)] + [p for p in base.get("LD_LIBRARY_PATH", "").split(":") if p]
    return {"LD_LIBRARY_PATH": ":".join(path), "NPU_STANDIN_LIBRARY": str(libdir / "libascendcl.so")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter with torch_npu installed")
    parser.add_argument("--print-env", action="store_true", help="print shell exports of the environment")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = parser.parse_args(argv)
    libdir = build(args.python, force=args.force)
    if args.print_env:
        for key, value in environment(args.python).items():
            print(f"export {key}={shlex.quote(value)}")
    else:
        print(libdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
