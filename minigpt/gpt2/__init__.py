"""Part 1, GPT-2 plainly: the model as pure functions over float32 arrays, every position computed
from scratch, no cache, no checks, no engine (docs/model.md).

Modules, in reading order:
    config   GPT-2's hyperparameters and the published sizes
    params   GPT-2's weights under Hugging Face's names, linear weights stored [n_in, n_out]
    layers   LayerNorm, GELU, the linear map, causal attention, the MLP, the block; the kernel set they run on
    forward  the forward pass for one sequence: embeddings, the blocks, the final LayerNorm, the LM head
"""
