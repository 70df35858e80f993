import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line is still being imported
    sys.stderr.write("mha-symbolic: interrupted\n")
    sys.exit(130)

sys.exit(main())
