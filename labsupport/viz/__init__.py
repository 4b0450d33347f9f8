"""Plotly figure builders: pure functions ``data → go.Figure``, no widgets inside."""
