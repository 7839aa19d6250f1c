"""`python -m rag_demo`: the command line (see cli.py)."""
import sys

from rag_demo.cli import main

sys.exit(main())
