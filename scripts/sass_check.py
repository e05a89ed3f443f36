"""SASS of the kernels without a GPU: assembles the build's PTX with ptxas (the nvidia-cuda-nvcc
wheel) for the architecture its `.target` line names (sm_80 for the shipped base module, sm_90a for
the module with the `wgmma` kernels), disassembles it with nvdisasm (the nvidia-cuda-nvdisasm wheel, installed here if
missing), and counts per kernel the instructions that say which path it is on: HMMA (`mma.sync`
tensor cores), HGMMA (`wgmma`), QGMMA (`wgmma` on e4m3), LDSM (ldmatrix), LDGSTS (cp.async), BAR, and LDL/STL (local
memory: register arrays that spilled). Exits non-zero if a `flash_tc` matrix kernel has no HMMA,
a `flash_wgmma` kernel no HGMMA or QGMMA, or any of them touches local memory, except the `wgmma` general
instances at d = 128 (length masks and dropout), which spill 80–104 bytes (reports/PERF_LOG*.md).

usage: python3 scripts/sass_check.py [PTX] > table.md
  e.g. ptx/attention_kernels.ptx (default), ptx/attention_kernels_sm90a.ptx, or a rebuilt module
  under target/ptx/<arch>/ (the rebuild-ptx feature)
The driver on the GPU machine assembles the same PTX with its own ptxas, so its SASS can differ in
scheduling; the instruction classes do not.
"""
import collections, os, re, subprocess, sys, tempfile

NVDISASM_WHEEL = "nvidia-cuda-nvdisasm==13.5.37"
CLASSES = ("HMMA", "HGMMA", "QGMMA", "LDSM", "LDGSTS", "BAR", "LDL", "STL")


def tool(module, name):
    try:
        mod = __import__(module, fromlist=["x"])
    except ImportError:
        return None
    path = os.path.join(list(mod.__path__)[0], "bin", name)
    return path if os.path.isfile(path) else None


def main():
    ptx = sys.argv[1] if len(sys.argv) > 1 else "ptx/attention_kernels.ptx"
    ptxas = tool("nvidia.cuda_nvcc", "ptxas")
    if ptxas is None:
        sys.exit("ptxas not found: run scripts/setup.sh")
    nvdisasm = tool("nvidia.cu13", "nvdisasm")
    if nvdisasm is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", NVDISASM_WHEEL], check=True)
        nvdisasm = tool("nvidia.cu13", "nvdisasm")
    target = re.search(r"^\.target\s+(sm_\w+)", open(ptx).read(), re.M)
    arch = target.group(1) if target else "sm_90"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([ptxas, f"-arch={arch}", ptx, "-o", cubin], check=True)
        sass = subprocess.run([nvdisasm, "-c", cubin], check=True, capture_output=True, text=True).stdout
    counts = collections.OrderedDict()
    kernel = None
    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            kernel = m.group(1)
            counts[kernel] = collections.Counter()
            continue
        if kernel is None:
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            op = m.group(1)
            for cls in CLASSES:
                if op == cls:
                    counts[kernel][cls] += 1
    print(f"# SASS instruction classes per kernel (ptxas {os.path.basename(os.path.dirname(os.path.dirname(ptxas)))}, {arch}, from {ptx})\n")
    print("| kernel | " + " | ".join(CLASSES) + " |")
    print("|---|" + "---|" * len(CLASSES))
    bad = []
    for k, c in counts.items():
        print(f"| {k} | " + " | ".join(str(c[cls]) for cls in CLASSES) + " |")
        # The backward's preprocess, dQ conversion, NaN-row and sink-gradient kernels are
        # elementwise: no products.
        products = not any(w in k for w in ("preprocess", "convert", "nan_rows", "d_sink"))
        local = c["LDL"] or c["STL"]
        if k.startswith("flash_tc") and ((products and c["HMMA"] == 0) or local):
            bad.append(k)
        spills_allowed = "_general_" in k and "_d128_" in k
        wgmma = c["HGMMA"] + c["QGMMA"]
        if k.startswith("flash_wgmma") and (wgmma == 0 or (local and not spills_allowed)):
            bad.append(k)
    if bad:
        sys.exit("tensor-core kernels without HMMA/HGMMA or with local memory: " + ", ".join(bad))


if __name__ == "__main__":
    main()
