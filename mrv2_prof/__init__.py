"""mrv2-prof: profile an embedded vLLM Model Runner V2 style runner."""

__version__ = "0.1.0"
