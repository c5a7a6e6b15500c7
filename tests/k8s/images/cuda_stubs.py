"""Stub CUDA libraries: PyPI's torch for CPU-only images without its CUDA wheels.

PyPI's Linux torch 2.13.0 is a CUDA build: libtorch_cpu.so itself has NEEDED entries for
libcudart.so.13 and libcupti.so.13, libtorch.so for libtorch_cuda.so, which needs cuBLAS,
cuDNN, NCCL, ... So without the nvidia-* wheels (2.7 GB installed, plus 0.7 GB triton)
`import torch` fails, and download.pytorch.org's CPU build is not reachable here.

Each stub has the SONAME and symbol version of the library it stands for and defines
exactly the symbols torch's own libraries import from it (functions return an error
code: cudaErrorNoDevice for the runtime, so torch sees no GPU; data symbols are zeroed
arrays of the real size). No CUDA function runs on a CPU-only path; torch.cuda reports no
device. The symbols are read from the real libraries: a torch install with its nvidia-*
wheels is needed once, on the build machine (the project's .venv has one).

    python cuda_stubs.py SITE_PACKAGES OUT_DIR
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# Loaded by the C library and the compiler runtime: never stubbed, even when a CUDA
# library happens to export one of their symbols too (operator new, memcpy, ...).
SYSTEM_LIBS = (
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
)
SYSTEM_DIR = Path("/lib/x86_64-linux-gnu")
# The driver is not a wheel either: torch already copes with its absence (CPU nodes).
NOT_STUBBED = {"libcuda.so.1"}
CUDA_NO_DEVICE = 100  # cudaErrorNoDevice: torch.cuda.device_count() is then 0, silently


def _lines(argv: list[str]) -> list[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()


def needed(lib: Path) -> list[str]:
    return re.findall(r"\(NEEDED\).*\[(.+)\]", "\n".join(_lines(["readelf", "-d", str(lib)])))


def missing_libraries(torch_dir: Path) -> tuple[list[str], set[str]]:
    """The CUDA sonames torch's libraries need, and the symbols they import."""
    ours = {p.name for p in (torch_dir / "lib").iterdir()}
    libs = [*sorted((torch_dir / "lib").glob("*.so")), *sorted(torch_dir.glob("*.so"))]
    wanted: set[str] = set()
    undefined: set[str] = set()
    for lib in libs:
        wanted.update(n for n in needed(lib) if n not in ours)
        undefined.update(
            ln.split()[-1].split("@")[0]
            for ln in _lines(["nm", "-D", "--undefined-only", str(lib)])
        )
    system: set[str] = set()
    for name in SYSTEM_LIBS:
        system.update(
            ln.split()[-1].split("@")[0]
            for ln in _lines(["nm", "-D", "--defined-only", str(SYSTEM_DIR / name)])
        )
    cuda = sorted(
        n
        for n in wanted - NOT_STUBBED
        if not re.match(r"(ld-linux|lib(c|m|dl|rt|pthread|gcc_s|stdc\+\+)\.so)", n)
    )
    return cuda, undefined - system


def write_stub(real: Path, soname: str, undefined: set[str], out: Path) -> int:
    """Compiles out/soname; returns how many symbols it defines."""
    functions: list[str] = []
    data: list[tuple[str, int]] = []
    versions: set[str] = set()
    for line in _lines(["nm", "-D", "--defined-only", "-S", str(real)]):
        parts = line.split()
        symbol, kind = parts[-1], parts[-2]
        name, _, version = symbol.partition("@@")
        name = name.split("@")[0]
        if version:
            versions.add(version)
        if name not in undefined or kind == "A":
            continue
        if kind in "TtWiu":
            functions.append(name)
        else:
            data.append((name, int(parts[1], 16) if len(parts) == 4 else 1))
    code = 100 if soname.startswith("libcudart") else 1
    source = [f"/* stub for {soname}: see cuda_stubs.py */"]
    source += [f"int {name}(void) {{ return {code}; }}" for name in sorted(set(functions))]
    source += [f"char {name}[{max(size, 1)}];" for name, size in sorted(set(data))]
    c_file = out / f"{soname}.c"
    c_file.write_text("\n".join(source) + "\n")
    argv = [
        "gcc",
        "-shared",
        "-fPIC",
        "-O1",
        "-o",
        str(out / soname),
        f"-Wl,-soname,{soname}",
        str(c_file),
    ]
    names = sorted({*functions, *(n for n, _ in data)})
    if versions and names:
        # One version node holding every symbol: the one torch's references name.
        node = soname if soname in versions else sorted(versions)[0]
        script = out / f"{soname}.map"
        script.write_text(f"{node} {{ global: {' '.join(n + ';' for n in names)} local: *; }};\n")
        argv.append(f"-Wl,--version-script={script}")
    subprocess.run(argv, check=True)
    c_file.unlink()
    if versions and names:
        (out / f"{soname}.map").unlink()
    return len(names)


def build_stubs(site_packages: Path, out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    cuda, undefined = missing_libraries(site_packages / "torch")
    cuda = [s for s in cuda if not (site_packages / "torch" / "lib" / s).exists()]
    written = []
    for soname in cuda:
        real = next(iter(sorted(site_packages.glob(f"nvidia/**/{soname}"))), None)
        if real is None:
            raise SystemExit(f"{soname}: not under {site_packages}/nvidia (torch's CUDA wheels)")
        count = write_stub(real, soname, undefined, out)
        written.append(f"{soname} ({count} symbols)")
    return written


if __name__ == "__main__":
    for line in build_stubs(Path(sys.argv[1]), Path(sys.argv[2])):
        print(line)
