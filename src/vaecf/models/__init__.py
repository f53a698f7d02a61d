"""Models: Mult-VAE and Mult-DAE with sparse input."""

from vaecf.models.multvae import ModelConfig, MultDAE, MultVAE, build_model

__all__ = ["ModelConfig", "MultDAE", "MultVAE", "build_model"]
