"""Thin command-line verbs over the library."""
