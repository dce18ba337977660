"""Screens of the dashboard and the run browser, one per module."""
