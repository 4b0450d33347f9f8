"""ipywidgets panels that wire sliders to core functions and ``viz`` figures (no core logic here)."""
