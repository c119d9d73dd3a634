from codeq.cli import main

main()
