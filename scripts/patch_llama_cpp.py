"""Patch llama-cpp-python's vendored llama.cpp before it is built (scripts/install_llama_cpp.sh).

One change, to ggml's CPU flash attention: GGML_CPU_FA_ROW_KERNEL=1 keeps every batch on the row
kernel instead of switching to the tiled kernel from 64 query rows. The tiled kernel groups KV
cells by their absolute index, so a row's numbers would depend on where its cells lie and on how
many rows share its call; on the row kernel they do not, and the engine can evaluate in calls of
any size and still give an answer that does not depend on server history or batch-mates
(llamadecide/engine/batches.py). Unset, ggml behaves as released. The engine finds out whether the
library it loads has the switch (the variable's name is in it) and otherwise keeps its calls under
64 rows.

    python scripts/patch_llama_cpp.py SOURCE_DIR   # the unpacked llama_cpp_python-VERSION sdist
"""

from __future__ import annotations

import sys
from pathlib import Path

SWITCH = "GGML_CPU_FA_ROW_KERNEL"
FUNCTION = f'''
// llamadecide: {SWITCH}=1 keeps flash attention on the row kernel for every batch size, so a
// row's result depends neither on its batch-mates nor on where its KV cells lie.
static bool ggml_fa_row_kernel_only(void) {{
    static const bool only = [] {{
        const char * env = getenv("{SWITCH}");
        return env != NULL && atoi(env) != 0;
    }}();
    return only;
}}
'''
ANCHOR = "static void ggml_compute_forward_flash_attn_ext_tiled("
TILED = "        bool use_tiled = !use_ref &&\n"


def patch(source: Path) -> None:
    path = source / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-cpu" / "ops.cpp"
    text = path.read_text(encoding="utf-8")
    if SWITCH in text:
        return
    if text.count(ANCHOR) != 1 or text.count(TILED) != 1:
        sys.exit(f"{path}: the flash-attention code is not what this patch knows; update scripts/patch_llama_cpp.py")
    text = text.replace(ANCHOR, FUNCTION + "\n" + ANCHOR)
    text = text.replace(TILED, "        bool use_tiled = !use_ref && !ggml_fa_row_kernel_only() &&\n")
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    patch(Path(sys.argv[1]))
