import sys

from dra_driver.main import main

sys.exit(main())
