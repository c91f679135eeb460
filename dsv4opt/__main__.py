from dsv4opt.cli import main

main()
