"""Small example environments; `count_files.py` is the template for a new env."""
