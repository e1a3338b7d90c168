"""Headroom: memory guard and launcher for Keras/TensorFlow training on a desktop."""

__version__ = "0.1.0"
