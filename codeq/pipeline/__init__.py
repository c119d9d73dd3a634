"""Stages of a round against the artifact store, and the local round."""
