"""Part 5, loading and checking: checkpoints on disk, the tokenizer, the model whose inputs are checked
once, at the public boundary, and the loader that puts them together (docs/loading.md, docs/tokenizer.md).

Modules, in reading order:
    files               what stands at a path
    safetensors_format  reading and writing safetensors, never unpickling
    weights             tensors by their checkpoint names
    checks              validation, once, at the boundary
    checkpoint          Hugging Face checkpoint directories, every tensor checked
    checkpoint_writer   writing every layout checkpoint reads, for the tests and scripts
    model               Model: GPT-2 with checked forwards
    tokenizer           GPT-2's byte-pair encoding through tiktoken, its tables packaged
    loader              a name -> checkpoint + tokenizer + model
"""
