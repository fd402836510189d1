from podhealth.cli import main

raise SystemExit(main())
