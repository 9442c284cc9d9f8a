"""What an installed torch_npu needs from CANN, read from the wheel itself.

Nothing here names a CANN function: the lists come from the installed
torch_npu's shared libraries (`nm -D`, `readelf -d`, `strings`) and the
prototypes from the ACL headers the wheel ships (`gcc -aux-info`). A new
torch_npu is a pin change.

- needed at load: undefined dynamic symbols of the libraries `import
  torch_npu` loads, minus what torch, the interpreter and the system define;
- looked up by name: identifiers in those libraries' strings that look like
  CANN entry points (acl*, aclnn*, rt*, Msprof*), found by dlsym at run time;
- stand-in libraries: the libraries those libraries need that nothing on the
  machine provides (CANN's), plus the ones torch_npu dlopens by name and this
  stand-in serves (SERVED_BY_NAME).

`write_stubs` writes a C file defining every such name that the hand-written
runtime does not define: success (0) or NULL, with the exact prototype where
the headers have one (the headers are included, so a wrong prototype is a
compile error); aclnn* kernels that are not implemented fail loudly instead.

Usage: python generate.py [--torch-npu DIR] [--defined NAMES_FILE] --out FILE.c
"""
import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Prefixes of the CANN entry points torch_npu looks up by name that this
# stand-in answers. HCCL/LCCL/dcmi/mspti lookups are left unanswered: torch_npu
# treats a missing symbol there as "feature absent".
LOOKUP_NAME = re.compile(r"^(acl[A-Za-z][A-Za-z0-9]+|rt[A-Z][A-Za-z0-9]+|Msprof[A-Za-z0-9]+)$")
MIN_NAME_LENGTH = 6
# Libraries torch_npu dlopens by name (FunctionLoader, op-plugin) whose
# symbols the stand-in serves; each stand-in library depends on libascendcl,
# so a dlsym on any of them finds the whole runtime.
SERVED_BY_NAME = ("libopapi", "libnnopbase", "libmsprofiler", "libruntime", "libascend_dump")
# C-compilable headers of the wheel that declare the entry points.
HEADER_DIRS = ("acl", "third_party/acl/inc/profiling")
# Stubs of these prefixes are kernels: when not implemented by hand they fail.
KERNEL_PREFIX = "aclnn"
# Names torch_npu looks up whose absence is better than a stub answering
# success: it then takes its documented fallback (or reports the feature
# missing) instead of trusting an empty answer.
PREFER_ABSENT = re.compile(
    r"^(aclmdlRI\w+|aclrtIpc\w+|aclrtMem(Export|Import|SetPid)\w*|"
    r"PTA\w+|aclrtGetMemUceInfo|aclrtMemUceRepair|aclrtDeviceTaskAbort|aclrtValueWait|aclrtValueWrite)$"
)


def torch_npu_dir(explicit=None) -> Path:
    if explicit:
        return Path(explicit)
    dist = importlib.metadata.distribution("torch_npu")
    return Path(dist.locate_file("torch_npu"))


def torch_dir(npu_dir: Path) -> Path:
    candidate = npu_dir.parent / "torch"
    if candidate.is_dir():
        return candidate
    return Path(importlib.metadata.distribution("torch").locate_file("torch"))


def _run(*cmd) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def needed_libraries(lib: Path) -> list:
    out = _run("readelf", "-d", str(lib))
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def system_library_paths() -> dict:
    """soname -> path, from the dynamic linker's cache."""
    found = {}
    for line in _run("ldconfig", "-p").splitlines():
        match = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if match and "x86-64" in match.group(2):
            found.setdefault(match.group(1), match.group(3))
    return found


def loaded_closure(npu_dir: Path, torch: Path):
    """The torch_npu libraries `import torch_npu` loads, and the sonames they
    need that neither torch_npu, torch nor the system provides."""
    local = {p.name: p for d in (npu_dir / "lib", torch / "lib") if d.is_dir() for p in d.glob("*.so*")}
    system = system_library_paths()
    todo = sorted(npu_dir.glob("_C*.so"))
    seen, missing, others = {}, set(), set()
    while todo:
        lib = todo.pop()
        if lib.name in seen:
            continue
        seen[lib.name] = lib
        for name in needed_libraries(lib):
            if name in local and local[name].parent == npu_dir / "lib":
                todo.append(local[name])
            elif name in local or name in system:
                others.add(local.get(name) or Path(system[name]))
            else:
                missing.add(name)
    return list(seen.values()), sorted(missing), sorted(others)


def dynamic_symbols(lib: Path, undefined: bool) -> set:
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", "-D", flag, str(lib)], capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if not parts:
            continue
        if undefined and parts[0] != "U":
            continue
        names.add(parts[-1].split("@")[0])
    return names


def interpreter_symbols(python: str) -> set:
    exe = Path(os.path.realpath(python))
    names = dynamic_symbols(exe, undefined=False)
    for lib in needed_libraries(exe):
        for candidate in (exe.parent.parent / "lib" / lib,):
            if candidate.exists():
                names |= dynamic_symbols(candidate, undefined=False)
    return names


def needed_at_load(closure, others, torch: Path, python: str) -> list:
    undefined = set().union(*(dynamic_symbols(lib, True) for lib in closure))
    defined = set().union(*(dynamic_symbols(lib, False) for lib in closure))
    for lib in list(others) + sorted((torch / "lib").glob("*.so*")):
        defined |= dynamic_symbols(lib, False)
    defined |= interpreter_symbols(python)
    return sorted(n for n in undefined - defined if not n.startswith("_"))


def strings_of(lib: Path) -> set:
    out = subprocess.run(["strings", "-n", str(MIN_NAME_LENGTH), str(lib)], capture_output=True, text=True).stdout
    return set(out.split("\n"))


def looked_up_by_name(closure, defined_by_torch_npu: set) -> list:
    words = set().union(*(strings_of(lib) for lib in closure))
    return sorted(w for w in words if LOOKUP_NAME.match(w) and w not in defined_by_torch_npu)


def libraries_by_name(closure) -> list:
    """Library names torch_npu dlopens (a string 'libX' or 'libX.so')."""
    words = set().union(*(strings_of(lib) for lib in closure))
    names = {re.sub(r"\.so$", "", w) for w in words if re.fullmatch(r"lib[a-z_0-9]+(\.so)?", w)}
    return sorted(n for n in names if n in SERVED_BY_NAME)


def header_files(npu_dir: Path) -> list:
    include = npu_dir / "include"
    files = []
    for sub in HEADER_DIRS:
        files += sorted((include / sub).glob("*.h"))
    return [h for h in files if _compiles_as_c(include, h)]


def include_flags(npu_dir: Path) -> list:
    include = npu_dir / "include"
    return [f"-I{include}", f"-I{include / 'third_party' / 'acl' / 'inc'}", "-DFUNC_VISIBILITY"]


def _compiles_as_c(include: Path, header: Path) -> bool:
    rel = header.relative_to(include)
    cc = shutil.which("cc") or "gcc"
    flags = include_flags(include.parent)
    done = subprocess.run([cc, "-std=c11", "-fsyntax-only", *flags, "-x", "c", "-"],
                          input=f'#include "{rel}"\n', capture_output=True, text=True)
    return done.returncode == 0


def prototypes(npu_dir: Path, headers) -> dict:
    """name -> (return type, [parameter types]) for every function the
    C-compilable headers declare (gcc -aux-info normalises declarations)."""
    include = npu_dir / "include"
    cc = shutil.which("cc") or "gcc"
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "all.c"
        source.write_text("".join(f'#include "{h.relative_to(include)}"\n' for h in headers))
        aux = Path(tmp) / "aux.txt"
        subprocess.run([cc, "-std=c11", *include_flags(npu_dir), f"-aux-info={aux}", "-fsyntax-only", str(source)],
                       check=True)
        text = aux.read_text()
    found = {}
    for line in text.splitlines():
        if str(include) not in line:
            continue
        decl = re.sub(r"^/\*.*?\*/\s*", "", line).strip().rstrip(";")
        match = re.match(r"^extern\s+(.*?)\b(\w+)\s*\((.*)\)$", decl)
        if match:
            found[match.group(2)] = (match.group(1).strip(), _split_params(match.group(3)))
    return found


def _split_params(text: str) -> list:
    text = text.strip()
    if text in ("void", "/* ??? */", ""):
        return []
    params, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            params.append(current.strip())
            current = ""
            continue
        depth += ch in "(["
        depth -= ch in ")]"
        current += ch
    params.append(current.strip())
    return params


def _named(param: str, name: str) -> str:
    """Put NAME where a declarator goes in an abstract parameter type."""
    if "(*)" in param:
        return param.replace("(*)", f"(*{name})", 1)
    if param.endswith("]"):
        at = param.index("[")
        return f"{param[:at]} {name}{param[at:]}"
    return f"{param} {name}"


def _stub(name: str, proto) -> str:
    kernel = name.startswith(KERNEL_PREFIX)
    if proto is None:
        ret, params = "int", []
    else:
        ret, params = proto
    variadic = params[-1:] == ["..."]
    named = params[:-1] if variadic else params
    args = ", ".join([_named(p, f"a{i}") for i, p in enumerate(named)] + ["..."] * variadic) or "void"
    unused = "".join(f"    (void)a{i};\n" for i in range(len(named)))
    visibility = "" if proto else "STANDIN_EXPORT "
    call = f'standin_unimplemented("{name}")' if kernel else f'standin_stub_called("{name}")'
    if ret == "void":
        body = f"    {call};\n"
    elif "*" in ret:
        body = f"    {call};\n    return {_pointer_result(ret)};\n"
    else:
        body = f"    return ({ret}){call};\n"
    return f"{visibility}{ret} {name}({args})\n{{\n{unused}{body}}}\n"


def _pointer_result(ret: str) -> str:
    return '""' if re.fullmatch(r"const\s+char\s*\*", ret) else "NULL"


def write_stubs(out: Path, names, protos, headers, npu_dir: Path) -> int:
    include = npu_dir / "include"
    lines = [
        "/* Generated by tests/platforms/npu_standin/generate.py from the installed torch_npu: do not edit. */",
        "#include <stddef.h>",
        "#include <stdint.h>",
        *(f'#include "{h.relative_to(include)}"' for h in headers),
        '#include "standin.h"',
        "",
    ]
    for name in names:
        lines.append(_stub(name, protos.get(name)))
    out.write_text("\n".join(lines))
    return len(names)


OP_API_HEADER = "third_party/op-plugin/op_plugin/utils/op_api_common_base.h"


def write_op_api_typedefs(out: Path, npu_dir: Path) -> int:
    """The op-api (nnopbase) function types op-plugin calls through, copied
    from the wheel's op_api_common_base.h as C typedefs (`_aclCreateTensor`,
    ..., and `standin_OpApiFunc` for a kernel's second phase): the hand-written
    functions are checked against them at compile time."""
    text = (npu_dir / "include" / OP_API_HEADER).read_text()
    typedefs = re.findall(r"^typedef struct acl\w+ acl\w+;", text, flags=re.M)
    typedefs += re.findall(r"^typedef\s+[^;{}]*\(\*_acl\w+\)\s*\([^;{}]*\);", text, flags=re.M)
    second_phase = re.search(r"using\s+OpApiFunc\s*=\s*([^;]*)\(\*\)\s*(\([^;]*\));", text)
    lines = ["/* Generated by tests/platforms/npu_standin/generate.py from the installed torch_npu: do not edit. */",
             "#ifndef NPU_STANDIN_OP_API_TYPEDEFS_H", "#define NPU_STANDIN_OP_API_TYPEDEFS_H",
             "#include <stdbool.h>", "#include <stdint.h>", '#include "acl/acl_base.h"', ""]
    lines += [re.sub(r"\s+", " ", t) for t in typedefs]
    if second_phase:
        lines.append(f"typedef {second_phase.group(1).strip()} (*standin_OpApiFunc){second_phase.group(2)};")
    lines += ["", "#endif", ""]
    out.write_text("\n".join(lines))
    return len(typedefs)


def scan(npu_dir: Path, python: str) -> dict:
    torch = torch_dir(npu_dir)
    closure, missing, others = loaded_closure(npu_dir, torch)
    own = set().union(*(dynamic_symbols(lib, False) for lib in closure))
    load = needed_at_load(closure, others, torch, python)
    by_name = looked_up_by_name(closure, own)
    headers = header_files(npu_dir)
    return {
        "torch_npu": str(npu_dir),
        "closure": [str(p) for p in closure],
        "standin_libraries": sorted({m.split(".so")[0] for m in missing} | set(libraries_by_name(closure))),
        "needed_at_load": load,
        "looked_up_by_name": by_name,
        "headers": [str(h) for h in headers],
    }


def stub_names(info: dict, defined: set) -> list:
    wanted = set(info["needed_at_load"]) | set(info["looked_up_by_name"])
    keep = {n for n in wanted if not PREFER_ABSENT.match(n) or n in info["needed_at_load"]}
    return sorted(keep - defined)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-npu", help="the installed torch_npu package directory")
    parser.add_argument("--python", default=sys.executable, help="the interpreter torch_npu runs in")
    parser.add_argument("--defined", help="file of names the hand-written runtime defines, one a line")
    parser.add_argument("--out", help="C file of stubs to write")
    parser.add_argument("--scan-json", help="write what the scan found as JSON")
    args = parser.parse_args(argv)
    npu_dir = torch_npu_dir(args.torch_npu)
    info = scan(npu_dir, args.python)
    defined = set(Path(args.defined).read_text().split()) if args.defined else set()
    names = stub_names(info, defined)
    if args.scan_json:
        Path(args.scan_json).write_text(json.dumps(dict(info, stubs=names), indent=1))
    if args.out:
        headers = [Path(h) for h in info["headers"]]
        count = write_stubs(Path(args.out), names, prototypes(npu_dir, headers), headers, npu_dir)
        print(f"{count} stubs -> {args.out}", file=sys.stderr)
    print(f"needed at load: {len(info['needed_at_load'])}, looked up by name: {len(info['looked_up_by_name'])}, "
          f"stand-in libraries: {' '.join(info['standin_libraries'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
