from pate_accountant.cli import main

raise SystemExit(main())
