"""The Gradio page: layout, handlers and HTML rendering. Imports no torch: handlers call the library."""
