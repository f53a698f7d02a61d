"""Data: raw interaction files -> prepared datasets (CSR splits, vocabularies, manifest).

Submodules are imported where used (`vaecf.data.prepare`, `vaecf.data.matrix`, ...), so that
preparing data never imports torch.
"""
