"""Model sources: model files, Hugging Face configs, published architectures, synthetic profiles."""
