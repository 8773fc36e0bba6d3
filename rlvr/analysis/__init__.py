"""Reading runs after (or while) they train: the run reader, HTML/Markdown reports, plots, the aha
finder and run comparison. Nothing here is imported by the trainer's step; matplotlib is imported
only by the plotting code."""
