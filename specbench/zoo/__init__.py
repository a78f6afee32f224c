"""specbench's own small reference models (the "zoo"): built by ``specbench zoo build`` and shipped as
package data; the short names (``specbench-ref/gsm8k-tiny``, ...) are :mod:`specbench.references`."""
