from scratchgpt.cli import main

raise SystemExit(main())
