"""The PyTorch twins of app.reference and their ONNX export; imports torch, so never on the serving path."""
