"""Part 6, requests: what a caller asks for, checked once into one Request whichever interface it came
from, before any work (docs/api.md, docs/logits-processing.md).

Modules, in reading order:
    structured  structured outputs: a regex, JSON schema, choice or grammar, each step's logits masked to it
    request     a request's options declared once and checked in one pass, then with the prompt against
                the model into the Request
    token_keys  options given as text (JSON, flags): logit_bias's keys read as the token ids they name
"""
