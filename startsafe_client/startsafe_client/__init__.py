"""The startsafe agent client (see README)."""
