from dsenv.cli import main

raise SystemExit(main())
