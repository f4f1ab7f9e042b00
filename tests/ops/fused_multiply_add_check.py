#!/usr/bin/python3
"""Checks that the code of the results promised to be the same bits on CPUs and GPUs fuses no
multiply-add (docs/architecture.md, "CUDA devices", Determinism; CMakeLists.txt's
LOCKSTEP_UNFUSED_CPU_SOURCES and LOCKSTEP_UNFUSED_CUDA_SOURCES).

CPU side: the objects of the CPU files compiled with -ffp-contract=off hold no fused
multiply-add instruction at all, and in elementwise.cpp (which fuses freely for the
activations) the functions of + - * / and the broadcast hold none either.

GPU side: in the PTX of the CUDA files compiled with --fmad=false, no kernel holds an fma (or
mad) on floating-point values, nor a product, sum or difference without a rounding mode, which
ptxas would be free to fuse. The kernels that call CUDA's math library (whose functions use
FMAs inside, and whose results are only promised to rounding) are the exceptions listed below;
each must still show FMAs, which proves the check reads the code it means to.

Run by CTest (tests/CMakeLists.txt) with the lists and the objects CMake built.
"""
import argparse
import re
import subprocess
import sys

# x86 (FMA3, FMA4) and AArch64 fused multiply-adds, scalar and vector.
CPU_FMA = re.compile(r"^(?:v?fn?m(?:add|sub)(?:sub|add)?(?:\d{3})?[ps][sdh]|fn?madd|fn?msub|fmla|fmls)$")

# Functions of the fusing file whose every operation is one IEEE operation per element.
CPU_SINGLE_OPERATION_FUNCTIONS = {
    "ops/cpu/elementwise.cpp": ["lockstep::cpu::binary<", "lockstep::cpu::broadcast_to<"],
}

PTX_FUSED = re.compile(r"\b(?:fma|mad)(?:\.[a-z0-9]+)*\.(?:f16|f16x2|bf16|bf16x2|f32|f64)\b")
PTX_UNROUNDED = re.compile(r"\b(?:mul|add|sub)(?:\.ftz|\.sat)*\.(?:f16|f16x2|bf16|bf16x2|f32|f64)\b")

# Kernels of the unfused files that may use FMAs, by file and demangled name.
PTX_EXEMPT = {
    "ops/cuda/elementwise_kernels.cu": [
        (re.compile(r"\bmap2?_kernel<lockstep::ops::cuda::\(anonymous namespace\)::(?:Gelu|GeluBackward|Tanh|Exp|Log),"),
         "the activations through CUDA's erfc, tanh, exp and log: equal to the CPU's to rounding only"),
    ],
    "ops/cuda/random_kernels.cu": [
        (re.compile(r"\bnormal_kernel<"), "normal fills: Box-Muller's log and cos, equal to the CPU's to rounding only"),
    ],
}


def find_file(paths, relative, suffixes):
    """The one path ending in src/lockstep/<relative> plus one of suffixes."""
    stem = relative.rsplit(".", 1)[0]
    wanted = [f"/src/lockstep/{relative}{s}" for s in suffixes] + [f"/src/lockstep/{stem}{s}" for s in suffixes]
    found = [p for p in paths if any(p.endswith(w) for w in wanted)]
    if len(found) != 1:
        sys.exit(f"fused_multiply_add_check: expected one built file for {relative}, found {found or 'none'}")
    return found[0]


def cpu_functions(objdump, path):
    """{demangled function name: [instruction mnemonics]} of an object file."""
    out = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", path], check=True, capture_output=True,
                         text=True).stdout
    functions, current = {}, None
    for line in out.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = functions.setdefault(header.group(1), [])
            continue
        insn = re.match(r"^\s+[0-9a-f]+:\s+(\S+)", line)
        if insn and current is not None:
            current.append(insn.group(1))
    return functions


def ptx_kernels(cxxfilt, path):
    """[(demangled name, body lines)] of the kernels (.entry) and device functions (.func) of a
    PTX file; declarations without a body are left out."""
    header = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+|\.extern\s+)*(?:\.entry|\.func)\s+(?:\([^)]*\)\s*)?([\w$]+)")
    blocks, name, body = [], None, None
    for line in open(path, encoding="utf-8"):
        line = line.split("//")[0].rstrip()
        if body is not None:
            if line == "}":
                blocks.append((name, body))
                name, body = None, None
            else:
                body.append(line)
            continue
        match = header.match(line)
        if match:
            name = match.group(1)
        elif name is not None and line == "{":
            body = []
        elif name is not None and line.endswith(";"):
            name = None  # a declaration
    names = subprocess.run([cxxfilt], input="\n".join(n for n, _ in blocks), check=True, capture_output=True,
                           text=True).stdout.splitlines()
    if len(names) != len(blocks):
        names = [n for n, _ in blocks]
    return list(zip(names, (b for _, b in blocks)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--objdump", required=True)
    parser.add_argument("--cxxfilt", required=True)
    parser.add_argument("--cpu", nargs="+", required=True, help="sources compiled with -ffp-contract=off")
    parser.add_argument("--cuda", nargs="+", required=True, help="sources compiled with --fmad=false")
    parser.add_argument("--objects", nargs="+", required=True, help="the library's object files")
    parser.add_argument("--ptx", nargs="+", required=True, help="the PTX of the --cuda sources")
    args = parser.parse_args()
    failures, checked = [], 0

    def report_cpu(relative, name, mnemonics, why):
        fused = sorted({m for m in mnemonics if CPU_FMA.match(m)})
        if fused:
            failures.append(f"{relative}: {name[:200]}: {', '.join(fused)} ({why})")

    for relative in args.cpu:
        for name, mnemonics in cpu_functions(args.objdump, find_file(args.objects, relative, [".o", ".obj"])).items():
            checked += 1
            report_cpu(relative, name, mnemonics, "the file compiles with -ffp-contract=off")
    for relative, prefixes in CPU_SINGLE_OPERATION_FUNCTIONS.items():
        functions = cpu_functions(args.objdump, find_file(args.objects, relative, [".o", ".obj"]))
        for prefix in prefixes:
            matched = [n for n in functions if prefix in n]
            if not matched:
                failures.append(f"{relative}: no function named {prefix}…: the check is out of date")
            for name in matched:
                checked += 1
                report_cpu(relative, name, functions[name], "one IEEE operation per element")

    for relative in args.cuda:
        kernels = ptx_kernels(args.cxxfilt, find_file(args.ptx, relative, [".ptx"]))
        if not kernels:
            failures.append(f"{relative}: no kernel in its PTX: the check is out of date")
        exempt = PTX_EXEMPT.get(relative, [])
        exempt_seen = [0] * len(exempt)
        for name, body in kernels:
            fused = [line.strip() for line in body if PTX_FUSED.search(line)]
            rule = next((i for i, (pattern, _) in enumerate(exempt) if pattern.search(name)), None)
            if rule is not None:
                exempt_seen[rule] += bool(fused)
                continue
            checked += 1
            unrounded = [line.strip() for line in body if PTX_UNROUNDED.search(line)]
            if fused:
                failures.append(f"{relative}: {name[:200]}: {len(fused)} fused, e.g. {fused[0]}")
            if unrounded:
                failures.append(f"{relative}: {name[:200]}: {len(unrounded)} without a rounding mode (ptxas may fuse "
                                f"them), e.g. {unrounded[0]}")
        for (pattern, why), seen in zip(exempt, exempt_seen):
            if not seen:
                failures.append(f"{relative}: no kernel matching {pattern.pattern} ({why}) shows an FMA: "
                                "the check cannot see them, or the exception is out of date")

    if failures:
        print("Fused multiply-adds in code whose results must be the CPU's bits:")
        for failure in failures:
            print("  " + failure)
        print(f"{len(failures)} failed")
        return 1
    print(f"fused_multiply_add_check: {checked} functions and kernels round every product and sum on its own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
