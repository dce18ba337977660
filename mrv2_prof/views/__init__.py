"""What every view shares: text formatting of numbers, units and durations.

Used by the printed summary, the HTML report and the Textual views alike; imports nothing of
the package, so each of them can import it without importing the others.
"""
