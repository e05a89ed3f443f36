"""SASS of the kernels without a GPU: assembles the build's PTX with ptxas (the nvidia-cuda-nvcc
wheel) for sm_90, disassembles it with nvdisasm (the nvidia-cuda-nvdisasm wheel, installed here if
missing), and counts per kernel the instructions that say which path it is on: HMMA (tensor cores),
LDSM (ldmatrix), LDGSTS (cp.async), BAR, and LDL/STL (local memory: register arrays that spilled).
Exits non-zero if a `flash_tc` matrix kernel has no HMMA, or any `flash_tc` kernel touches local
memory.

usage: python3 scripts/sass_check.py [PTX] > table.md
The driver on the GPU machine assembles the same PTX with its own ptxas, so its SASS can differ in
scheduling; the instruction classes do not.
"""
import collections, os, re, subprocess, sys, tempfile

NVDISASM_WHEEL = "nvidia-cuda-nvdisasm==13.5.37"


def tool(module, name):
    try:
        mod = __import__(module, fromlist=["x"])
    except ImportError:
        return None
    path = os.path.join(list(mod.__path__)[0], "bin", name)
    return path if os.path.isfile(path) else None


def main():
    ptx = sys.argv[1] if len(sys.argv) > 1 else "target/ptx/sm_90/attention_kernels.ptx"
    ptxas = tool("nvidia.cuda_nvcc", "ptxas")
    if ptxas is None:
        sys.exit("ptxas not found: run scripts/setup.sh")
    nvdisasm = tool("nvidia.cu13", "nvdisasm")
    if nvdisasm is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", NVDISASM_WHEEL], check=True)
        nvdisasm = tool("nvidia.cu13", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([ptxas, "-arch=sm_90", ptx, "-o", cubin], check=True)
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
            for cls in ("HMMA", "LDSM", "LDGSTS", "BAR", "LDL", "STL"):
                if op == cls:
                    counts[kernel][cls] += 1
    print(f"# SASS instruction classes per kernel (ptxas {os.path.basename(os.path.dirname(os.path.dirname(ptxas)))}, sm_90, from {ptx})\n")
    print("| kernel | HMMA | LDSM | LDGSTS | BAR | LDL | STL |")
    print("|---|---|---|---|---|---|---|")
    bad = []
    for k, c in counts.items():
        print(f"| {k} | {c['HMMA']} | {c['LDSM']} | {c['LDGSTS']} | {c['BAR']} | {c['LDL']} | {c['STL']} |")
        # The backward's preprocess and dQ conversion kernels are elementwise: no products.
        products = not any(w in k for w in ("preprocess", "convert"))
        if k.startswith("flash_tc") and ((products and c["HMMA"] == 0) or c["LDL"] or c["STL"]):
            bad.append(k)
    if bad:
        sys.exit("tensor-core kernels without HMMA or with local memory: " + ", ".join(bad))


if __name__ == "__main__":
    main()
