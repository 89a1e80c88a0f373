"""Patch llama-cpp-python's vendored llama.cpp before it is built (scripts/install_llama_cpp.sh, and the
Docker images, which run the same install script).

Two switches in ggml's CPU flash attention, each read once per process; unset, ggml behaves as released:

- GGML_CPU_FA_INVARIANT=1 (what the engine uses): every batch goes to a tiled kernel whose result for a
  query row depends only on that row and the KV cells it sees, in cell order
  (scripts/llama_cpp_invariant_attention.cpp). It computes scores with the same tile GEMMs as ggml's
  own tiled kernel, but takes the softmax against the row's maximum over all its cells and accumulates
  V in cell order, so where tiles fall (which depends on cell indices and batch-mates) changes nothing.
- GGML_CPU_FA_ROW_KERNEL=1 (the earlier way, kept for comparison in benchmarks.attention): every batch on
  ggml's row kernel, which visits a row's cells one at a time. As invariant, but it re-reads every K
  and V cell for each query row and head, and costs up to twice as much at long context.

Without either, ggml switches to its tiled kernel from 64 query rows, which groups KV cells by their
absolute index, so a row's numbers would depend on where its cells lie and on its batch-mates. The
engine finds out which switches the loaded library has (their names are in it) and, with neither,
keeps its calls under 64 rows (llamadecide/engine/decoder.py).

    python scripts/patch_llama_cpp.py SOURCE_DIR   # the unpacked llama_cpp_python-VERSION sdist
"""

from __future__ import annotations

import sys
from pathlib import Path

ROW_SWITCH = "GGML_CPU_FA_ROW_KERNEL"
INVARIANT_KERNEL = Path(__file__).with_name("llama_cpp_invariant_attention.cpp")
ROW_FUNCTION = f'''
// llamadecide: {ROW_SWITCH}=1 keeps flash attention on the row kernel for every batch size, so a
// row's result depends neither on its batch-mates nor on where its KV cells lie.
static bool ggml_fa_row_kernel_only(void) {{
    static const bool only = [] {{
        const char * env = getenv("{ROW_SWITCH}");
        return env != NULL && atoi(env) != 0;
    }}();
    return only;
}}
'''
# (anchor, replacement): each anchor must occur exactly once in the released source.
EDITS = [
    ("#include <algorithm>\n", "#include <algorithm>\n#include <vector>\n"),
    ("static void ggml_compute_forward_flash_attn_ext_tiled(",
     ROW_FUNCTION + "\nstatic void ggml_compute_forward_flash_attn_ext_tiled("),
    ("static void ggml_compute_forward_flash_attn_ext_f16(\n",
     "@INVARIANT@\nstatic void ggml_compute_forward_flash_attn_ext_f16(\n"),
    ("    const bool use_split_kv_path = !use_ref && (neq1 == 1",
     "    const bool use_split_kv_path = !use_ref && !ggml_fa_invariant() && (neq1 == 1"),
    ("        bool use_tiled = !use_ref &&\n",
     "        bool use_tiled = !use_ref && !ggml_fa_row_kernel_only() &&\n"),
    ("        int current_chunk = ith;\n\n        while (current_chunk < nchunk) {",
     "        if (!use_ref && ggml_fa_invariant() && q->type == GGML_TYPE_F32 && kv_is_f32_or_f16 && k->type == v->type &&\n"
     "            k->ne[2] == v->ne[2] && k->ne[3] == v->ne[3]) {\n"
     "            ggml_compute_forward_flash_attn_ext_invariant(params, dst);  // its own split of the work\n"
     "            return;\n"
     "        }\n"
     "        int current_chunk = ith;\n\n        while (current_chunk < nchunk) {"),
]


def patch(source: Path) -> None:
    path = source / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-cpu" / "ops.cpp"
    text = path.read_text(encoding="utf-8")
    if "GGML_CPU_FA_INVARIANT" in text:
        return
    for anchor, _ in EDITS:
        if text.count(anchor) != 1:
            sys.exit(f"{path}: the flash-attention code is not what this patch knows ({anchor.strip()[:60]!r}); "
                     "update scripts/patch_llama_cpp.py")
    kernel = INVARIANT_KERNEL.read_text(encoding="utf-8")
    for anchor, replacement in EDITS:
        text = text.replace(anchor, replacement.replace("@INVARIANT@", kernel))
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    patch(Path(sys.argv[1]))
