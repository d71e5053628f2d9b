"""Files in and out, safely: inputs refused unless regular (`inputs`), strict YAML (`strict_yaml`),
output folders written atomically (`outdir`) under an advisory lock (`lock`), tables as Parquet
and CSV (`tables`, `arrow`)."""
