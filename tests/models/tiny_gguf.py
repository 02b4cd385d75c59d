"""Small GGUF files for tests, laid out the way llama.cpp's converter writes them."""
from __future__ import annotations

import gguf as gguf_lib
import numpy as np


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: the q/k row order llama.cpp stores."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_and_close(writer: gguf_lib.GGUFWriter) -> None:
    """Write the header, metadata and tensors added to ``writer``, then close its file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
