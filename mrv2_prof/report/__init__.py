"""Views over stored runs: reports, exports, comparison and the migration gate.

Reads the store only; never imports ``mrv2_prof.runner`` or Textual.
"""
