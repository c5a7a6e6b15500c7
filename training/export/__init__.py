"""`uerl export`: a checkpoint's policies as ONNX files in Schola's inference interface."""
