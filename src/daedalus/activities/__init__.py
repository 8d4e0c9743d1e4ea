"""@activity.defn steps: thin, each does one I/O step by calling agents/, engines/ or store/."""
