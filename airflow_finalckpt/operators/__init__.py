"""The stage operator (``stage.py``), its failure handling and its "Pipeline" extra link."""
