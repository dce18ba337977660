"""Where the cells of a sweep run: one after another or several at once on this host
(``local``), or as tasks on a Ray cluster (``ray_cells``); ``cells`` is what they share."""
