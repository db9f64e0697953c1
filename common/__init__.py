"""What the input pipeline and the jobs share, below both and importing neither: the error
types and the command-line tools' error exit (errors), the one path layer for local and gs://
paths with its checkpoint manifests (fileio), and the lock of a directory that one writer
owns (dirlock)."""
