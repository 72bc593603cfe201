"""The PyTorch twins of app.reference and their ONNX export; imports torch, so never on the serving path.

options.py alone imports no torch: `normserve export --help` answers without the export extra.
"""
