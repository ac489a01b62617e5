# Under SWITCH_S=<seconds>, set the interpreter's GIL switch interval (an A/B aid for the server).
import os, sys
_v = os.environ.get("SWITCH_S")
if _v:
    sys.setswitchinterval(float(_v))
