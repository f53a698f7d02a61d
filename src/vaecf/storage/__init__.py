"""What vaecf writes to disk, safely: every file of a run, a dataset or an output goes through
these modules.

    safewrite.py   atomic files and directories (temp, fsync, rename), disk-full errors in words
    writelock.py   one writer per output: a lock beside it, taken over from a dead holder
    checkpoint.py  checkpoint files with a SHA-256 footer, verified when read
"""
