from gptrain.cli import main

raise SystemExit(main())
