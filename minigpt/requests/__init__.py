"""Part 6, requests: what a caller asks for, checked once into one Request whichever interface it came
from, before any work (docs/api.md, docs/logits-processing.md).

Modules, in reading order:
    structured  structured outputs: a regex, JSON schema, choice or grammar, each step's logits masked to it
    options     a request's options declared once: keywords, defaults, bounds, help, checks
    request     a request checked against the model, before any work
"""
